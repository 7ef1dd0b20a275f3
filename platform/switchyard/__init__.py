"""switchyard: an internal AI platform on one Ray cluster."""

__version__ = "0.1.0"
