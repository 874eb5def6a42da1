"""Table metadata kept in ordinary ranges: the root range (namespaces and tables, container 0)
and each container's meta range (the hash ranges of the tables placed on that container)."""
