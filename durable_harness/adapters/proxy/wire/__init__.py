"""What differs between model APIs for the proxy: one :class:`~.wire.base.WireFormat` per
API, one module each (anthropic, responses, chat)."""
