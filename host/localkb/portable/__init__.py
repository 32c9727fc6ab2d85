"""Portable ``.awkb`` files: export, validated import, and the optional encryption envelope."""
