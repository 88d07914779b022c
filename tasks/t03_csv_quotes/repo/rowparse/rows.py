"""Parsing of single CSV lines from the export files."""


def parse_row(line):
    """The fields of one CSV line; double-quoted fields may contain commas."""
    return [field.strip('"') for field in line.rstrip("\n").split(",")]
