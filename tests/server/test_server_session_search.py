"""`RestClient.search_sessions` over the calling key's own sessions."""

from __future__ import annotations

import pytest
import tinker
from tinker.types import (
    ActiveSessionStatusQuery,
    ClientFinishedSessionStatusQuery,
    SessionSearchRequest,
    UserSearchOwner,
)

from tests.server.server_helpers import new_run, start_server

ALICE, BOB = "tml-search-alice", "tml-search-bob"
pytestmark = pytest.mark.filterwarnings("ignore:RestClient.search_sessions is experimental")


def test_search_finds_own_sessions_by_name_metadata_and_status(tiny_model_dir, base_model,
                                                               tmp_path):
    server = start_server(tiny_model_dir, tmp_path, api_keys=f"{ALICE},{BOB}")
    try:
        with tinker.ServiceClient(base_url=server.url, api_key=ALICE,
                                  user_metadata={"study": "s1"}) as first:
            new_run(first, base_model).save_state("kept").result()
        with tinker.ServiceClient(base_url=server.url, api_key=ALICE) as second, \
                tinker.ServiceClient(base_url=server.url, api_key=BOB) as other:
            new_run(second, base_model)
            new_run(other, base_model)
            rest = tinker.RestClient(base_url=server.url, api_key=ALICE)
            everything = rest.search_sessions(SessionSearchRequest()).result().sessions
            assert len(everything) == 2  # Bob's session is not Alice's to see
            by_meta = rest.search_sessions(
                SessionSearchRequest(user_metadata={"study": "s1"})).result().sessions
            assert len(by_meta) == 1 and by_meta[0].checkpoints_count == 1
            done = rest.search_sessions(SessionSearchRequest(
                statuses=[ClientFinishedSessionStatusQuery(reasons=["success"])])).result()
            assert [s.session_id for s in done.sessions] == [by_meta[0].session_id]
            running = rest.search_sessions(
                SessionSearchRequest(statuses=[ActiveSessionStatusQuery()])).result().sessions
            assert len(running) == 1 and running[0].session_id != by_meta[0].session_id
            page = rest.search_sessions(SessionSearchRequest(limit=1)).result()
            rest_page = rest.search_sessions(
                SessionSearchRequest(limit=1, cursor=page.next_cursor)).result()
            assert {page.sessions[0].session_id, rest_page.sessions[0].session_id} == {
                s.session_id for s in everything}
            assert rest_page.next_cursor is None
            with pytest.raises(tinker.BadRequestError, match="other owners"):
                rest.search_sessions(SessionSearchRequest(
                    owner=UserSearchOwner(owner_urns=["urn:x"]))).result()
    finally:
        server.stop()
