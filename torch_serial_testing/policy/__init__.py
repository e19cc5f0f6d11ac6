"""The trust policy: which globals may ever be allowlisted, and the snippets that allowlist them."""
