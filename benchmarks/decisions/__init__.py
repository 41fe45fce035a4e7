"""Scripts that settled a design choice; the first line of each says which, with the number."""
