"""Pure decisions on what arrives: a message and a read-only view in, accept / reject / defer out."""
