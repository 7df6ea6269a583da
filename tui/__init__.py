"""adaflash-tui: the Textual dashboard over `jobs` and the run log (entry point: tui.app:main)."""
