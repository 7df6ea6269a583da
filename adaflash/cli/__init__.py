"""The `adaflash` command line: one module per command group, imported only when used."""
