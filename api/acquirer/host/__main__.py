"""``python -m api.acquirer.host`` — ``idempay acquirer`` without the rest of the CLI."""

from api.acquirer.host.cli import app

app(prog_name="idempay acquirer")
