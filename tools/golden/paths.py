"""Where the golden makers read and write, relative to this checkout (the makers are run by
hand from any directory; the paths do not depend on it)."""

import os

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TOOLS)
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "golden")
ENGRAM = os.path.join(ROOT, "tests", "fixtures", "engram")
TOKENIZER = os.path.join(ROOT, "assets", "tokenizer", "tokenizer.json")
