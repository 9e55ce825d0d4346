// The console's one script (served by the server; no build step, no CDN).
// Each element with data-live="N" and an id is refreshed every N seconds:
// the page is fetched again and the element's content replaced by the new
// one's. A session that ended sends the browser to the login.
"use strict";

function refresh(element, seconds) {
  const tick = async () => {
    if (document.hidden) {
      // A tab nobody looks at asks for nothing; it catches up when shown again.
      window.setTimeout(tick, seconds * 1000);
      return;
    }
    try {
      const answer = await fetch(window.location.href, {
        credentials: "same-origin",
        cache: "no-store",
      });
      if (answer.redirected && new URL(answer.url).pathname === "/console/login") {
        window.location.reload();
        return;
      }
      if (answer.ok) {
        const page = new DOMParser().parseFromString(await answer.text(), "text/html");
        const fresh = page.getElementById(element.id);
        if (fresh && fresh.innerHTML !== element.innerHTML) {
          element.innerHTML = fresh.innerHTML;
          element.dataset.refreshed = new Date().toISOString();
        }
      }
    } catch (error) {
      // The server is away for a moment (a restart): try again next time.
    }
    window.setTimeout(tick, seconds * 1000);
  };
  window.setTimeout(tick, seconds * 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  for (const element of document.querySelectorAll("[data-live][id]")) {
    const seconds = Number(element.dataset.live);
    if (seconds > 0) {
      refresh(element, seconds);
    }
  }
});
