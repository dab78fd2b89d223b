"""headedit's Textual terminal UI, installed as `headedit.tui`.

A thin shell over the library: every action calls the same pipeline functions as the CLI and renders
their typed events. Importing `headedit` never imports this package (nor textual).
"""
