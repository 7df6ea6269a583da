"""The tab panes of adaflash-tui, one module each."""
