"""The native-messaging edge: framing, the host loop, the request handlers, and the installer."""
