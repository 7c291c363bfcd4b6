"""Where the tests find the project and the shared real configs, wherever a test file sits."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository
SHARED = ROOT.parent / "shared"  # ../shared beside the checkout (real configs; absent in some clones)
SHARED_CONFIGS = SHARED / "configs"
