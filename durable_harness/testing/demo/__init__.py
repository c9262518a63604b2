"""The demo's tools and model script; also the fixtures of the crash-matrix tests."""
