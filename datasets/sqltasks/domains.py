"""Schema blueprints for the generated corpus: one parent/child pair of tables per domain.

Each domain names a parent entity and a child entity that references it, each with a name
column, one categorical column (with its value pool), one integer and one decimal column; the
child also has a date. Every identifier has an alternative spelling, so that schema variants
rename tables and columns and a model cannot lean on memorised names. The split of a domain is
fixed here: dev and test domains never appear in train.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    names: tuple[str, str]
    """Spelling in variant 0 and in the renamed variants."""
    phrase: str
    """How a question refers to it."""
    values: tuple[str, ...] = ()
    low: float = 0.0
    high: float = 0.0


@dataclass(frozen=True)
class Entity:
    tables: tuple[str, str]
    singular: str
    plural: str
    name: Column
    category: Column
    number: Column
    amount: Column


@dataclass(frozen=True)
class Blueprint:
    domain: str
    split: str
    parent: Entity
    child: Entity
    date: Column


def _pair(spec: str) -> tuple[str, str]:
    first, _, second = spec.partition("/")
    return first, second or first


def _col(spec: str) -> Column:
    """`name/alt:phrase[:v1,v2,..|low-high]`."""
    names, phrase, *rest = spec.split(":")
    column = Column(_pair(names), phrase)
    if rest and "-" in rest[0] and "," not in rest[0]:
        low, high = rest[0].split("-")
        return Column(column.names, phrase, low=float(low), high=float(high))
    if rest:
        return Column(column.names, phrase, values=tuple(rest[0].split(",")))
    return column


def _entity(tables: str, nouns: str, name: str, category: str, number: str, amount: str):
    singular, plural = nouns.split("/")
    return Entity(_pair(tables), singular, plural, _col(name), _col(category), _col(number),
                  _col(amount))


def _bp(domain: str, split: str, parent: tuple[str, ...], child: tuple[str, ...], date: str):
    return Blueprint(domain, split, _entity(*parent), _entity(*child), _col(date))


BLUEPRINTS: tuple[Blueprint, ...] = (
    _bp("library", "train",
        ("authors/writers", "author/authors", "name/full_name:name",
         "country/nationality:country:USA,UK,France,India,Japan,Brazil",
         "birth_year/year_born:birth year:1940-1995", "royalty_rate/royalty_pct:royalty rate:5-25"),
        ("books/titles", "book/books", "title/book_title:title",
         "genre/category:genre:fiction,history,science,poetry,travel,biography",
         "pages/page_count:number of pages:80-900", "price/list_price:price:5-60"),
        "published_on/release_date:publication date"),
    _bp("retail", "train",
        ("stores/shops", "store/stores", "name/store_name:name",
         "region/area:region:north,south,east,west,central",
         "opened_year/year_opened:opening year:1990-2022", "floor_area/area_sqm:floor area:80-900"),
        ("sales/orders", "sale/sales", "reference/order_ref:reference",
         "channel/sales_channel:channel:online,in-store,phone,partner",
         "quantity/units:quantity:1-40", "amount/total_amount:amount:10-900"),
        "sold_on/order_date:sale date"),
    _bp("hospital", "train",
        ("doctors/physicians", "doctor/doctors", "name/doctor_name:name",
         "specialty/speciality:specialty:cardiology,oncology,pediatrics,neurology,surgery",
         "experience_years/years_practising:years of experience:1-40",
         "hourly_rate/rate_per_hour:hourly rate:60-300"),
        ("appointments/visits", "appointment/appointments", "patient/patient_name:patient",
         "status/visit_status:status:completed,cancelled,no-show,rescheduled",
         "duration_min/minutes:duration in minutes:10-120", "fee/charge:fee:20-500"),
        "scheduled_on/visit_date:appointment date"),
    _bp("school", "train",
        ("teachers/instructors", "teacher/teachers", "name/full_name:name",
         "subject/department:subject:math,physics,history,art,biology,music",
         "hired_year/year_hired:hiring year:1995-2023",
         "salary_k/salary_thousands:salary in thousands:35-120"),
        ("courses/classes", "course/courses", "title/course_title:title",
         "level/course_level:level:intro,intermediate,advanced,honors",
         "enrolled/enrolment:number of enrolled students:5-60",
         "credits_fee/tuition:tuition fee:100-2000"),
        "starts_on/start_date:start date"),
    _bp("airline", "train",
        ("airports/airfields", "airport/airports", "name/airport_name:name",
         "country/nation:country:Spain,Germany,Italy,Norway,Poland,Greece",
         "runways/runway_count:number of runways:1-6",
         "landing_fee/fee_per_landing:landing fee:100-2500"),
        ("flights/departures", "flight/flights", "code/flight_code:flight code",
         "aircraft/plane_type:aircraft:A320,B737,A330,E190,B787",
         "passengers/pax:number of passengers:20-300", "fare/avg_fare:average fare:40-900"),
        "departs_on/departure_date:departure date"),
    _bp("movies", "train",
        ("directors/filmmakers", "director/directors", "name/director_name:name",
         "country/home_country:country:USA,France,Korea,Mexico,Italy,India",
         "debut_year/first_film_year:debut year:1960-2015",
         "avg_rating/mean_rating:average rating:1-10"),
        ("films/movies", "film/films", "title/film_title:title",
         "genre/film_genre:genre:drama,comedy,horror,action,documentary,animation",
         "runtime/minutes:runtime in minutes:70-200",
         "budget_m/budget_millions:budget in millions:1-250"),
        "released_on/release_date:release date"),
    _bp("sports", "train",
        ("teams/clubs", "team/teams", "name/team_name:name",
         "league/division:league:east,west,premier,national,coastal",
         "founded/year_founded:founding year:1880-2010",
         "payroll_m/payroll_millions:payroll in millions:5-300"),
        ("players/athletes", "player/players", "name/player_name:name",
         "position/role:position:guard,forward,center,keeper,winger",
         "goals/goals_scored:number of goals:0-40",
         "salary_k/wage_thousands:salary in thousands:30-900"),
        "signed_on/contract_date:signing date"),
    _bp("hr", "train",
        ("departments/divisions", "department/departments", "name/dept_name:name",
         "site/location:site:Berlin,Austin,Lagos,Osaka,Lima,Oslo",
         "headcount_target/planned_headcount:headcount target:5-120",
         "budget_k/budget_thousands:budget in thousands:100-5000"),
        ("employees/staff", "employee/employees", "name/employee_name:name",
         "grade/pay_grade:grade:junior,mid,senior,lead,principal",
         "age/employee_age:age:21-66", "salary/annual_salary:salary:30000-180000"),
        "hired_on/start_date:hire date"),
    _bp("restaurants", "train",
        ("restaurants/eateries", "restaurant/restaurants", "name/restaurant_name:name",
         "cuisine/food_style:cuisine:thai,italian,mexican,indian,french,japanese",
         "seats/seat_count:number of seats:15-200", "rating/stars:rating:1-5"),
        ("reservations/bookings", "reservation/reservations", "guest/guest_name:guest",
         "occasion/purpose:occasion:birthday,business,date,family,other",
         "party_size/guests:party size:1-12", "deposit/prepaid:deposit:0-200"),
        "reserved_for/booking_date:reservation date"),
    _bp("real_estate", "train",
        ("agents/brokers", "agent/agents", "name/agent_name:name",
         "agency/firm:agency:Keystone,Harbor,Summit,Maple,Crest",
         "licensed_year/license_year:licensing year:1985-2022",
         "commission_pct/commission_rate:commission rate:1-6"),
        ("listings/properties", "listing/listings", "address/street_address:address",
         "property_type/kind:property type:condo,house,townhouse,studio,loft",
         "bedrooms/bedroom_count:number of bedrooms:1-6",
         "price_k/asking_price_k:asking price in thousands:90-2500"),
        "listed_on/listing_date:listing date"),
    _bp("music", "train",
        ("artists/musicians", "artist/artists", "name/artist_name:name",
         "genre/style:genre:jazz,rock,pop,folk,electronic,classical",
         "formed_year/year_formed:formation year:1960-2020",
         "monthly_listeners_m/listeners_millions:monthly listeners in millions:0-80"),
        ("albums/records", "album/albums", "title/album_title:title",
         "label/record_label:label:Indigo,Polar,Redwood,Halcyon,Static",
         "tracks/track_count:number of tracks:6-24",
         "sales_k/copies_sold_k:sales in thousands:1-900"),
        "released_on/release_date:release date"),
    _bp("logistics", "train",
        ("warehouses/depots", "warehouse/warehouses", "name/depot_name:name",
         "city/town:city:Rotterdam,Hamburg,Antwerp,Genoa,Gdansk,Lyon",
         "docks/dock_count:number of docks:2-30",
         "rent_k/monthly_rent_k:monthly rent in thousands:10-400"),
        ("shipments/consignments", "shipment/shipments", "tracking/tracking_code:tracking code",
         "carrier/haulier:carrier:rail,truck,barge,air,courier",
         "weight_kg/mass_kg:weight in kilograms:5-4000", "cost/freight_cost:cost:20-5000"),
        "shipped_on/dispatch_date:shipping date"),
    _bp("university", "train",
        ("faculties/schools", "faculty/faculties", "name/faculty_name:name",
         "campus/site:campus:north,south,city,riverside,hill",
         "founded/year_founded:founding year:1850-2005",
         "endowment_m/endowment_millions:endowment in millions:5-900"),
        ("students/learners", "student/students", "name/student_name:name",
         "program/degree:program:BSc,BA,MSc,MA,PhD",
         "credits/credit_count:number of credits:0-240", "gpa/grade_average:GPA:1-4"),
        "enrolled_on/enrolment_date:enrolment date"),
    _bp("banking", "train",
        ("branches/offices", "branch/branches", "name/branch_name:name",
         "region/district:region:north,south,east,west,capital",
         "tellers/teller_count:number of tellers:1-25",
         "deposits_m/deposits_millions:deposits in millions:5-900"),
        ("accounts/holdings", "account/accounts", "holder/holder_name:holder",
         "account_type/kind:account type:checking,savings,business,student,joint",
         "age_months/months_open:age in months:1-240", "balance/current_balance:balance:0-90000"),
        "opened_on/open_date:opening date"),
    _bp("hotels", "train",
        ("hotels/lodgings", "hotel/hotels", "name/hotel_name:name",
         "city/location:city:Lisbon,Prague,Vienna,Dublin,Seville,Krakow",
         "rooms/room_count:number of rooms:10-400", "nightly_rate/base_rate:nightly rate:40-600"),
        ("stays/bookings", "stay/stays", "guest/guest_name:guest",
         "room_type/category:room type:single,double,suite,family,deluxe",
         "nights/night_count:number of nights:1-21", "total/amount_paid:amount paid:40-9000"),
        "check_in/arrival_date:check-in date"),
    _bp("games", "train",
        ("studios/developers", "studio/studios", "name/studio_name:name",
         "country/home_country:country:Canada,Poland,Japan,Sweden,USA,Finland",
         "staff/staff_count:number of staff:5-900",
         "revenue_m/revenue_millions:revenue in millions:1-900"),
        ("games/titles", "game/games", "title/game_title:title",
         "platform/system:platform:pc,console,mobile,handheld,vr",
         "players_k/player_count_k:players in thousands:1-900", "price/retail_price:price:0-70"),
        "launched_on/launch_date:launch date"),
    _bp("agriculture", "train",
        ("farms/holdings", "farm/farms", "name/farm_name:name",
         "province/region:province:Lowland,Upland,Coastal,Delta,Valley",
         "hectares/area_ha:area in hectares:5-900", "subsidy_k/grant_k:subsidy in thousands:0-300"),
        ("harvests/yields", "harvest/harvests", "batch/batch_code:batch code",
         "crop/produce:crop:wheat,barley,maize,rice,soy,oats",
         "tonnes/tons:tonnage:1-500", "price_per_tonne/unit_price:price per tonne:90-600"),
        "harvested_on/harvest_date:harvest date"),
    _bp("museum", "train",
        ("galleries/halls", "gallery/galleries", "name/gallery_name:name",
         "wing/section:wing:east,west,north,annex,garden",
         "floor/level:floor:0-5", "area_sqm/size_sqm:area in square meters:50-900"),
        ("artworks/pieces", "artwork/artworks", "title/work_title:title",
         "medium/material:medium:oil,bronze,marble,watercolor,photograph,textile",
         "year_made/creation_year:year made:1500-2020",
         "value_k/insured_value_k:insured value in thousands:5-9000"),
        "acquired_on/acquisition_date:acquisition date"),
    _bp("energy", "dev",
        ("plants/stations", "plant/plants", "name/plant_name:name",
         "fuel/source:fuel:solar,wind,hydro,gas,nuclear,biomass",
         "capacity_mw/capacity:capacity in megawatts:5-2000",
         "efficiency/efficiency_pct:efficiency:20-60"),
        ("outages/incidents", "outage/outages", "ticket/ticket_code:ticket",
         "cause/reason:cause:storm,fault,maintenance,overload,fire",
         "duration_h/hours:duration in hours:1-96", "loss_k/cost_k:loss in thousands:1-900"),
        "started_on/start_date:start date"),
    _bp("veterinary", "dev",
        ("clinics/practices", "clinic/clinics", "name/clinic_name:name",
         "town/city:town:Ashford,Bexley,Corby,Dover,Ely,Frome",
         "vets/vet_count:number of vets:1-15", "consult_fee/base_fee:consultation fee:20-120"),
        ("pets/animals", "pet/pets", "name/pet_name:name",
         "species/kind:species:dog,cat,rabbit,parrot,horse,hamster",
         "age/pet_age:age:0-20", "weight_kg/mass_kg:weight in kilograms:0-600"),
        "registered_on/registration_date:registration date"),
    _bp("publishing", "dev",
        ("journals/magazines", "journal/journals", "title/journal_name:title",
         "field/discipline:field:biology,economics,physics,law,medicine",
         "founded/year_founded:founding year:1880-2015", "impact/impact_factor:impact factor:0-30"),
        ("articles/papers", "article/articles", "headline/paper_title:headline",
         "article_type/kind:article type:research,review,letter,editorial,case",
         "citations/citation_count:number of citations:0-900",
         "apc/processing_charge:processing charge:0-4000"),
        "published_on/publication_date:publication date"),
    _bp("transit", "dev",
        ("lines/routes", "line/lines", "name/line_name:name",
         "mode/vehicle:mode:bus,tram,metro,ferry,rail",
         "stops/stop_count:number of stops:4-60", "length_km/route_km:length in kilometers:2-90"),
        ("trips/journeys", "trip/trips", "code/trip_code:trip code",
         "fare_type/ticket_type:fare type:adult,child,senior,student,pass",
         "riders/passengers:number of riders:1-400", "revenue/takings:revenue:5-3000"),
        "ran_on/service_date:service date"),
    _bp("charity", "test",
        ("campaigns/appeals", "campaign/campaigns", "name/campaign_name:name",
         "cause/focus:cause:health,education,climate,housing,water,animals",
         "year_started/launch_year:launch year:2000-2023",
         "goal_k/target_k:goal in thousands:10-900"),
        ("donations/gifts", "donation/donations", "donor/donor_name:donor",
         "method/payment_method:payment method:card,cash,transfer,cheque,online",
         "age/donor_age:donor age:18-90", "amount/gift_amount:amount:5-5000"),
        "donated_on/gift_date:donation date"),
    _bp("fitness", "test",
        ("gyms/clubs", "gym/gyms", "name/gym_name:name",
         "district/area:district:Docklands,Oldtown,Uptown,Harbor,Midtown",
         "trainers/trainer_count:number of trainers:1-30",
         "monthly_fee/membership_fee:monthly fee:10-150"),
        ("members/subscribers", "member/members", "name/member_name:name",
         "plan/membership_plan:plan:basic,plus,premium,student,family",
         "visits/visit_count:number of visits:0-300", "spend/total_spend:total spend:0-3000"),
        "joined_on/join_date:join date"),
    _bp("astronomy", "test",
        ("observatories/telescopes", "observatory/observatories", "name/site_name:name",
         "country/host_country:country:Chile,Spain,USA,Australia,Namibia",
         "altitude_m/elevation_m:altitude in meters:100-5000",
         "aperture_m/mirror_m:aperture in meters:1-40"),
        ("observations/sightings", "observation/observations", "target/object_name:target",
         "band/wavelength_band:band:optical,infrared,radio,ultraviolet,xray",
         "exposure_s/seconds:exposure in seconds:1-3600", "magnitude/brightness:magnitude:1-25"),
        "observed_on/observation_date:observation date"),
    _bp("insurance", "test",
        ("policies/contracts", "policy/policies", "number/policy_number:policy number",
         "product/line_of_business:product:auto,home,travel,life,pet",
         "term_years/duration_years:term in years:1-30",
         "premium/annual_premium:annual premium:100-5000"),
        ("claims/incidents", "claim/claims", "reference/claim_ref:reference",
         "claim_status/state:claim status:open,approved,rejected,paid,review",
         "days_open/age_days:days open:1-400", "amount/claimed_amount:amount claimed:50-90000"),
        "filed_on/filing_date:filing date"),
)

DOMAINS: dict[str, Blueprint] = {b.domain: b for b in BLUEPRINTS}
SPLITS = ("train", "dev", "test")
