"""FastAPI routers; each route is one line over ``GatewayService``."""
