"""The bottom layer: plain types, the exception tree, the World and Sandbox seams, settings,
canonical JSON and the journal's stored format (keys.py). Imports nothing else of the
package; every other layer may import it."""
