"""Storage containers (the unit of placement) and the routing of table requests to ranges."""
