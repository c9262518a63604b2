"""Fakes that ship in the package: the scripted fake model servers, the demo, the crash
matrix. May import every layer below the CLI; production code never imports it, except
``cli/`` on top (``demo``, ``fake-model``, ``crash-matrix``)."""
