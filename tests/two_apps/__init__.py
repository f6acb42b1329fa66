"""Two apps that both define a tool named ``scoped_refund`` and a workflow ``ScopedRefunder``
(tests/test_tool_scope.py runs them in one process of their own)."""
