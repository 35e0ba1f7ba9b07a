# ruff: noqa: E501  (one entity per line reads better than wrapped lines)
"""Application themes for the multi-table corpus, written in a small line format and parsed here.

Each theme is a set of entities that occur together in one kind of application. One line per
entity: `singular/plural: field, field, ...`, where a field is

- `words:kind`: an attribute; `words` (underscored) is how questions name it; kinds are
  `person` (a person's name), `label:Suffix` (a generated name such as "Kalomi Suffix"),
  `cat:a|b|c` (a category), `int:lo-hi`, `money:lo-hi`, `date`, `bool`, `city`, `email`;
- `role>entity`: a foreign key to `entity` (`>entity` alone: the role is the entity's name);
  a key to the entity itself is a self-reference (a manager, a parent category);
- a trailing `?` on any field: the column may be NULL.

A line that starts with `*` is a junction table (many-to-many) between its first two keys.
The first `person` or `label` attribute is an entity's display column, the one questions name
it by. The split of a theme is fixed here: dev and test themes never appear in train.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Field:
    words: str
    """Underscored words, e.g. `birth_date`; also the column's base name."""
    kind: str
    """person, label, cat, int, money, date, bool, city, email, or ref."""
    arg: str = ""
    """The kind's parameter: the category values, a range, a label suffix, the referenced
    entity."""
    nullable: bool = False

    @property
    def phrase(self) -> str:
        return self.words.replace("_", " ")


@dataclass(frozen=True)
class EntitySpec:
    singular: str
    plural: str
    fields: tuple[Field, ...]
    junction: bool = False

    @property
    def refs(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.kind == "ref")

    @property
    def display(self) -> Field | None:
        return next((f for f in self.fields if f.kind in ("person", "label")), None)


@dataclass(frozen=True)
class Theme:
    name: str
    split: str
    entities: tuple[EntitySpec, ...]

    def entity(self, singular: str) -> EntitySpec:
        return next(e for e in self.entities if e.singular == singular)


_THEMES: dict[str, tuple[str, str]] = {
    "clinic": ("train", """
        patient/patients: full_name:person, birth_date:date, city:city, insurance_plan:cat:basic|silver|gold?, phone_verified:bool
        doctor/doctors: full_name:person, specialty:cat:cardiology|dermatology|pediatrics|neurology|oncology, hired_on:date, salary:money:90000-250000, supervisor>doctor?
        department/departments: title:label:Wing, floor:int:1-6, budget:money:100000-900000
        *assignment/assignments: >doctor, >department, started_on:date?
        appointment/appointments: >patient, >doctor, scheduled_on:date, status:cat:booked|completed|cancelled|no_show, fee:money:40-400
        prescription/prescriptions: >appointment, drug_name:label:Tablets, dose_mg:int:5-500, refills:int:0-5?
        room/rooms: code:label:Room, >department, beds:int:1-4
        invoice/invoices: >patient, issued_on:date, amount:money:20-3000, paid:bool, method:cat:card|cash|insurance?
    """),
    "retail": ("train", """
        customer/customers: full_name:person, email:email, city:city, joined_on:date, loyalty_tier:cat:bronze|silver|gold|platinum?
        store/stores: store_name:label:Market, city:city, opened_on:date, floor_area:int:200-5000
        product/products: product_name:label:Lamp, category:cat:kitchen|garden|toys|office|sports, unit_price:money:2-900, stock:int:0-500?, discontinued:bool
        supplier/suppliers: company_name:label:Supply, country:cat:Spain|Poland|Japan|Brazil|Kenya, rating:int:1-5?
        *product_supplier/product_suppliers: >product, >supplier, lead_days:int:1-60
        purchase/purchases: >customer, >store, purchased_on:date, total:money:5-2500, channel:cat:online|in_store|phone
        purchase_line/purchase_lines: >purchase, >product, quantity:int:1-12, line_total:money:2-1800
        employee/employees: full_name:person, >store, role:cat:cashier|manager|stocker|security, hourly_wage:money:11-45, manager>employee?
        return_request/return_requests: line>purchase_line, requested_on:date, reason:cat:damaged|wrong_size|late|changed_mind, approved:bool?
    """),
    "library": ("train", """
        member/members: full_name:person, city:city, registered_on:date, membership:cat:adult|student|senior|child, fines_owed:money:0-80?
        author/authors: full_name:person, born_on:date?, nationality:cat:Irish|Chilean|Korean|Nigerian|Danish
        book/books: title:label:Tales, genre:cat:mystery|history|poetry|science|fantasy, published_year:int:1950-2024, pages:int:80-900, shelf_price:money:5-60?
        *book_author/book_authors: >book, >author, author_order:int:1-3
        branch/branches: branch_name:label:Branch, city:city, opened_on:date
        copy/copies: >book, >branch, acquired_on:date, condition:cat:new|good|worn|damaged
        loan/loans: >copy, >member, borrowed_on:date, returned_on:date?, late_fee:money:0-25?
        reservation/reservations: >book, >member, reserved_on:date, fulfilled:bool
    """),
    "restaurant": ("train", """
        restaurant/restaurants: venue_name:label:Kitchen, city:city, cuisine:cat:thai|italian|mexican|ethiopian|korean, seats:int:20-200, opened_on:date
        chef/chefs: full_name:person, >restaurant, rank:cat:head|sous|line|pastry, salary:money:30000-120000, mentor>chef?
        dish/dishes: dish_name:label:Bowl, >restaurant, course:cat:starter|main|dessert|drink, price:money:3-65, vegetarian:bool, calories:int:80-1400?
        ingredient/ingredients: ingredient_name:label:Root, allergen:cat:none|nuts|gluten|dairy|shellfish, cost_per_kg:money:1-90
        *dish_ingredient/dish_ingredients: >dish, >ingredient, grams:int:5-400
        diner/diners: full_name:person, city:city, vip:bool
        booking/bookings: >diner, >restaurant, booked_for:date, party_size:int:1-12, status:cat:confirmed|seated|cancelled
        review/reviews: >diner, >restaurant, stars:int:1-5, posted_on:date, tip:money:0-60?
    """),
    "hotel": ("train", """
        hotel/hotels: hotel_name:label:Inn, city:city, stars:int:1-5, opened_on:date
        room_type/room_types: type_name:label:Suite, nightly_rate:money:40-900, max_guests:int:1-6
        room/rooms: room_number:int:100-999, >hotel, >room_type, floor:int:1-20, smoking:bool
        guest/guests: full_name:person, nationality:cat:French|Indian|Mexican|Egyptian|Canadian, birth_date:date?, email:email
        stay/stays: >guest, >room, check_in:date, nights:int:1-14, total_charge:money:40-9000, source:cat:direct|agency|app
        amenity/amenities: amenity_name:label:Service, fee:money:0-120, category:cat:spa|food|transport|leisure
        *stay_amenity/stay_amenities: >stay, >amenity, times_used:int:1-6
        staff_member/staff_members: full_name:person, >hotel, job:cat:reception|housekeeping|concierge|maintenance, hired_on:date, lead>staff_member?
    """),
    "warehouse": ("train", """
        warehouse/warehouses: site_name:label:Depot, city:city, capacity_m3:int:1000-90000, opened_on:date
        item/items: sku_name:label:Crate, weight_kg:money:1-800, hazard_class:cat:none|flammable|corrosive|toxic, fragile:bool
        stock_level/stock_levels: >warehouse, >item, on_hand:int:0-2000, counted_on:date
        carrier/carriers: carrier_name:label:Freight, mode:cat:road|rail|sea|air, on_time_rate:int:50-99?
        shipment/shipments: origin>warehouse, >carrier, shipped_on:date, delivered_on:date?, freight_cost:money:50-9000, status:cat:pending|in_transit|delivered|lost
        *shipment_item/shipment_items: >shipment, >item, units:int:1-300
        driver/drivers: full_name:person, >carrier, licence_class:cat:B|C|CE|D, hired_on:date, trainer>driver?
        inspection/inspections: >warehouse, inspected_on:date, score:int:40-100, passed:bool, inspector:person
    """),
    "sports_league": ("train", """
        league/leagues: league_name:label:League, founded_year:int:1890-2015, country:cat:Italy|Ghana|Peru|Vietnam|Norway
        team/teams: team_name:label:United, >league, city:city, founded_on:date, budget:money:100000-9000000
        player/players: full_name:person, >team, position:cat:goalkeeper|defender|midfielder|forward, birth_date:date, salary:money:20000-2000000?, captain:bool
        coach/coaches: full_name:person, >team, role:cat:head|assistant|fitness, since:date, mentor>coach?
        stadium/stadiums: stadium_name:label:Arena, city:city, capacity:int:2000-80000
        fixture/fixtures: home>team, away>team, >stadium, played_on:date, home_goals:int:0-6?, away_goals:int:0-6?, attendance:int:500-80000?
        injury/injuries: >player, injured_on:date, body_part:cat:knee|ankle|hamstring|shoulder|back, days_out:int:3-200
        *transfer_fee/transfer_fees: >player, from>team, fee:money:0-5000000, signed_on:date
    """),
    "real_estate": ("train", """
        agency/agencies: agency_name:label:Realty, city:city, founded_on:date
        agent/agents: full_name:person, >agency, licence_year:int:1990-2023, commission_rate:money:1-6, senior>agent?
        property/properties: street:label:Street, city:city, kind:cat:flat|house|studio|loft|cottage, bedrooms:int:0-6, area_m2:int:25-400, asking_price:money:60000-2500000, built_year:int:1900-2023?
        owner/owners: full_name:person, email:email, phone_verified:bool
        *ownership/ownerships: >property, >owner, share_percent:int:10-100
        listing/listings: >property, >agent, listed_on:date, list_price:money:60000-2500000, status:cat:active|under_offer|sold|withdrawn
        viewing/viewings: >listing, visitor:person, viewed_on:date, rating:int:1-5?
        sale/sales: >listing, sold_on:date, sale_price:money:50000-2400000, mortgage:bool
    """),
    "hr_company": ("dev", """
        department/departments: dept_name:label:Division, cost_center:int:1000-9999, budget:money:50000-5000000
        employee/employees: full_name:person, >department, job_title:cat:engineer|analyst|designer|manager|recruiter, hired_on:date, salary:money:30000-220000, manager>employee?, remote:bool
        project/projects: project_name:label:Initiative, >department, started_on:date, deadline:date?, priority:cat:low|medium|high|critical
        *project_member/project_members: >project, >employee, hours_per_week:int:2-40
        leave_request/leave_requests: >employee, starts_on:date, days:int:1-30, kind:cat:vacation|sick|parental|unpaid, approved:bool?
        review_cycle/review_cycles: >employee, reviewed_on:date, score:int:1-5, reviewer>employee?
        training_course/training_courses: course_title:label:Workshop, provider:cat:internal|external|online, cost:money:0-4000
        *enrolment/enrolments: >employee, course>training_course, completed_on:date?
    """),
    "conference": ("dev", """
        venue/venues: venue_name:label:Hall, city:city, capacity:int:50-3000
        conference/conferences: conf_name:label:Summit, >venue, starts_on:date, days:int:1-5, fee:money:0-1500
        speaker/speakers: full_name:person, affiliation:label:Institute, country:cat:Chile|Japan|Germany|Nigeria|India, keynote:bool
        session/sessions: session_title:label:Talk, >conference, >speaker, held_on:date, track:cat:research|industry|tutorial|panel, minutes:int:15-120
        attendee/attendees: full_name:person, email:email, student:bool, city:city?
        *registration/registrations: >attendee, >conference, paid:money:0-1500, registered_on:date
        sponsor/sponsors: company_name:label:Labs, >conference, level:cat:bronze|silver|gold, amount:money:1000-90000
        rating/ratings: >attendee, >session, stars:int:1-5, comment_length:int:0-400?
    """),
    "veterinary": ("test", """
        owner/owners: full_name:person, city:city, phone_verified:bool, registered_on:date
        pet/pets: pet_name:label:Paws, >owner, species:cat:dog|cat|rabbit|parrot|ferret, birth_date:date?, weight_kg:money:0-80, mother>pet?
        vet/vets: full_name:person, specialty:cat:surgery|dentistry|exotics|general, hired_on:date, salary:money:50000-180000
        visit/visits: >pet, >vet, visited_on:date, reason:cat:checkup|vaccine|injury|surgery|dental, charge:money:20-4000, follow_up:bool
        medication/medications: med_name:label:Drops, unit_cost:money:1-200, controlled:bool
        *visit_medication/visit_medications: >visit, >medication, doses:int:1-30
        clinic_branch/clinic_branches: branch_name:label:Clinic, city:city, opened_on:date, >vet
        insurance_policy/insurance_policies: >pet, insurer:cat:PetSure|Wagwell|Furst|Cover4, monthly_premium:money:5-120, started_on:date, active:bool
    """),
    "farm": ("test", """
        farm/farms: farm_name:label:Acres, region:cat:north|south|east|west|central, hectares:int:5-2000, organic:bool
        field/fields: field_code:label:Plot, >farm, area_ha:money:1-300, soil:cat:clay|loam|sand|silt, irrigated:bool
        crop/crops: crop_name:label:Seed, family:cat:grain|legume|root|leafy|fruit, days_to_harvest:int:40-240
        planting/plantings: >field, >crop, sown_on:date, harvested_on:date?, yield_tonnes:money:0-900?
        worker/workers: full_name:person, >farm, role:cat:picker|driver|supervisor|agronomist, hourly_rate:money:9-40, supervisor>worker?
        machine/machines: model_name:label:Tractor, >farm, bought_on:date, price:money:5000-400000, fuel:cat:diesel|electric|petrol
        *machine_operator/machine_operators: >machine, operator>worker, certified_on:date
        buyer/buyers: company_name:label:Foods, city:city, pays_late:bool
        harvest_sale/harvest_sales: >planting, >buyer, sold_on:date, tonnes:money:1-400, price_per_tonne:money:50-2000
    """),
}


_FIELD = re.compile(r"^(?P<words>[a-z_0-9]*)(?P<sep>[:>])(?P<rest>.+?)(?P<null>\?)?$")


def _parse_field(text: str) -> Field:
    match = _FIELD.match(text.strip())
    if match is None:
        raise ValueError(f"cannot parse field {text!r}")
    words, rest, nullable = match["words"], match["rest"], bool(match["null"])
    if match["sep"] == ">":
        return Field(words or rest, "ref", rest, nullable)
    kind, _, arg = rest.partition(":")
    return Field(words, kind, arg, nullable)


def parse_entity(line: str) -> EntitySpec:
    junction = line.startswith("*")
    head, _, body = line.lstrip("*").partition(":")
    singular, _, plural = head.strip().partition("/")
    fields = tuple(_parse_field(f) for f in body.split(","))
    return EntitySpec(singular, plural, fields, junction)


GENERIC = """
    app_user/app_users: full_name:person, email:email, created_on:date, admin:bool
    tag/tags: tag_name:label:Tag, color:cat:red|blue|green|gray|amber
    note/notes: author>app_user, written_on:date, pinned:bool, word_count:int:3-400?
"""
"""Tables any application has beside its own (users of the app, tags, notes): every theme may
draw them, so schemas mix a domain's tables with unrelated ones."""


@cache
def themes() -> dict[str, Theme]:
    """Every theme, parsed and checked (references resolve, names are unique)."""
    out = {}
    for name, (split, text) in _THEMES.items():
        entities = tuple(parse_entity(line.strip())
                         for line in (text + GENERIC).splitlines() if line.strip())
        known = {e.singular for e in entities}
        for entity in entities:
            words = [f.words for f in entity.fields]
            if len(set(words)) != len(words):
                raise ValueError(f"{name}.{entity.singular}: duplicate field names")
            for ref in entity.refs:
                if ref.arg not in known:
                    raise ValueError(f"{name}.{entity.singular}: unknown entity {ref.arg!r}")
            if entity.junction and len(entity.refs) < 2:
                raise ValueError(f"{name}.{entity.singular}: a junction needs two keys")
        out[name] = Theme(name, split, entities)
    return out
