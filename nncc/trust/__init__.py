"""Keyed trust: which artifacts' native code runs without --trust-native."""
