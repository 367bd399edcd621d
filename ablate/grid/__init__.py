"""Grids: the grid file format and its cells (spec), running every cell once (runner), a grid
folder's state read from its run directories (state) and as `ablate status` shows it (status)."""
