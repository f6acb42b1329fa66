from exactcall.cli._main import entry

entry()
