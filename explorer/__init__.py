"""The explorer's views (Streamlit): app.py renders the page, these modules hold its sidebar, state and
caches."""
