"""A small text classifier served by batchfleet: the worked example of docs/models.md."""
