"""LocalKB: personal knowledge bases on your own machine, answered with citations."""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
