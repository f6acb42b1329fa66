"""Undo after the fact (`exactcall undo`): which calls to undo, and undoing them once."""
