"""``exactcall quickstart``: each installed agent framework, crashed and recovered, with and
without exactcall (see :mod:`exactcall.quickstart.run`). ``exactcall.quickstart.<framework>``
holds that framework's two agents; importing this package imports no framework."""
