"""The Streamlit dashboard: ``pantheon dashboard`` runs :data:`APP` with ``streamlit run``.

Importing this package does not import Streamlit; the app file does.
"""

from pathlib import Path

__all__ = ["APP"]

#: The script ``streamlit run`` executes (it reads the store named by ``$PANTHEON_STORE``).
APP = Path(__file__).with_name("app.py")
