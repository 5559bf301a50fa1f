"""Code the test files share (fixtures are in tests/conftest.py)."""
