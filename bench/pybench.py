"""What the Python benchmarks share: the python/ package on sys.path (import this first) and
the closing JSON summary."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))


def emit(result, path=None):
    """Prints `result` as one JSON object (keys sorted) and also writes it to `path` if given."""
    text = json.dumps(result, sort_keys=True)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
