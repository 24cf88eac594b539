"""The API's operations, one module per concern, each an :class:`~fastapi.APIRouter` per access level.

``unguarded`` routers never need the token, ``reads`` need it when reads are guarded, ``mutations``
whenever the daemon has one: :func:`~source_backfill.api.app.create_app` applies the guard as it
includes them.
"""
