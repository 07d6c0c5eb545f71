"""The compiled replay core (built from ``ext/``); private, not public API."""
