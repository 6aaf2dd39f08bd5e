"""Turning frames into what a reader sees: one function per figure (`figures`) and per table
(`tables`), the fixed look (`style`), and the Markdown / self-contained HTML document
(`document`).
"""
