import json
import os

from kernelcore.metrics import StatLoggerBase


class DummyStatLogger(StatLoggerBase):
    """Counts the steps it saw; appends a line per call to $KC_DUMMY_STAT_FILE when set."""

    def __init__(self, config=None):
        super().__init__(config)
        self.num_records = 0

    def record(self, stats):
        self.num_records += 1
        path = os.environ.get("KC_DUMMY_STAT_FILE")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "num_records": self.num_records}) + "\n")
