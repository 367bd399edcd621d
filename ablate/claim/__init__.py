"""What `ablate reproduce` runs for a claim: its selectors checked against its grid (selectors),
which cells and seeds a design trains (design), and the looks of `--decide` (looks)."""
