"""The torch reference of every op: the contract each backend keeps, and the path wherever
no faster one applies."""
