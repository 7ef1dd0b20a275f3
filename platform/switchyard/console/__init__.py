"""The read-only web console and offline report: pages, charts and the figures behind them."""
