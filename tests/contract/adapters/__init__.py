"""One contract file per adapter (tests/contract/adapters/test_<adapter>.py)."""
