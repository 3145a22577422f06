"""Who may ask and how much: API keys, rate limits (local and shared), usage accounting."""
