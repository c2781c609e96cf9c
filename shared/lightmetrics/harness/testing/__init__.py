"""Tools for tests, the demo and chaos runs: fault injection at the client."""
