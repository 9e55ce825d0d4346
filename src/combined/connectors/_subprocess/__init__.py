"""What the connectors that run a program share (Singer taps, Airbyte sources).

The program runs as a child process in its own process group
(:mod:`._process`), with its configuration in private files
(:mod:`._settings`); its standard output is read as JSON lines and its
records gathered into bounded, checked Arrow batches (:mod:`._rows`) by the
JSON Schema -> Arrow mapping (:mod:`._schema`). :mod:`._run` holds the
one-shot call (discovery) and the base of a one-stream read.
"""
