"""The pi agent: the real ``pi`` CLI behind the journaling proxy (adapter.py), with its
provider choice, journaling extension (extension.js), session file and canonical request
form. Imports adapters.cli, adapters.proxy and the layers below; no other agent's
package."""
