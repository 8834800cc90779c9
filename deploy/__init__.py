"""Deploy: policy server, robot client, robot adapters, safety layer."""
