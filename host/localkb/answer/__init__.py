"""Answers: the privacy gate, the model endpoints and their client, and grounded chat."""
