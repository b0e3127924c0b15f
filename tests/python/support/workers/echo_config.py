"""Prints this worker's TF_CONFIG (no TensorFlow): checks the launcher's set-up."""

import os
import sys

print("TF_CONFIG=" + os.environ["TF_CONFIG"])
print("message to stderr", file=sys.stderr)
