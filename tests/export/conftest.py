import os
import tempfile

# transformers copies an export's modelling code into its module cache: one of the test session's
# own, not the user's ~/.cache (set before transformers is imported, which reads it then)
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="lengthgen-hf-modules-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
