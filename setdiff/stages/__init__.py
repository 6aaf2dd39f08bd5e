"""Pipeline stages: each module parses --params and paths, calls the library, writes outputs."""
