"""Pure constructors of the objects an attempt consists of: parent + attempt in, manifest out."""
