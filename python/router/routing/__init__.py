"""Region selection, health, admission, retry budget, hedging and continuation."""
