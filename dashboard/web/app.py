"""Entry script for ``streamlit run`` (Streamlit re-executes it on every interaction)."""

from dashboard.web._app import main

main()
