"""What the connectors that run a program share (Singer taps, Airbyte sources).

The program runs as a child process in its own process group, and dies with
Combined (:mod:`._process`); its configuration is in private files
(:mod:`._private`), which the next run removes if their owner was killed.
Its standard output is read as JSON lines and its records gathered into
bounded, checked Arrow batches (:mod:`._rows`) by the JSON Schema -> Arrow
mapping (:mod:`._schema`). :mod:`._run` holds the one-shot call (discovery)
and the base of a one-stream read.
"""
