"""Budgets: the ledger's client side, and the worker that batches reservations."""
