"""Entry script for ``streamlit run`` (Streamlit re-executes it on every interaction): the
page the URL names, ``?session=ID`` a session's page, no parameter the sessions list."""

import streamlit as st

from dashboard.web._app import SESSION_PARAM, sessions_page
from dashboard.web._session import session_page
from pantheon.sessions import resolve_store_path

st.set_page_config(page_title="Pantheon", page_icon="🏛", layout="wide")
path = resolve_store_path(None).resolve()
ref = st.query_params.get(SESSION_PARAM)
if ref:
    session_page(path, ref)
else:
    sessions_page(path)
