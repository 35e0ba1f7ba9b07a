-- A second copy of `The maintenance system of a delivery company's vehicle fleet, in a legacy abbreviated style`: the same schema, values redrawn (sqltasks.transfer.redraw).
CREATE TABLE depot (depot_id INTEGER PRIMARY KEY, depot_nm VARCHAR NOT NULL, city VARCHAR NOT NULL, opened_dt DATE NOT NULL);
CREATE TABLE vehicle (veh_id INTEGER PRIMARY KEY, reg_no VARCHAR NOT NULL, make VARCHAR NOT NULL, model_yr INTEGER NOT NULL, fuel_type VARCHAR NOT NULL, depot_id INTEGER NOT NULL REFERENCES depot(depot_id), odometer_km INTEGER NOT NULL, retired BOOLEAN NOT NULL);
CREATE TABLE driver (drv_id INTEGER PRIMARY KEY, first_nm VARCHAR NOT NULL, last_nm VARCHAR NOT NULL, license_cls VARCHAR NOT NULL, hire_dt DATE NOT NULL, depot_id INTEGER NOT NULL REFERENCES depot(depot_id), mentor_drv_id INTEGER REFERENCES driver(drv_id));
CREATE TABLE trip (trip_id INTEGER PRIMARY KEY, veh_id INTEGER NOT NULL REFERENCES vehicle(veh_id), drv_id INTEGER NOT NULL REFERENCES driver(drv_id), start_dt DATE NOT NULL, distance_km DECIMAL(8, 1) NOT NULL, fuel_l DECIMAL(6, 1), purpose VARCHAR NOT NULL);
CREATE TABLE work_order (wo_id INTEGER PRIMARY KEY, veh_id INTEGER NOT NULL REFERENCES vehicle(veh_id), opened_dt DATE NOT NULL, closed_dt DATE, wo_type VARCHAR NOT NULL, labor_hrs DECIMAL(5, 1) NOT NULL, total_cost DECIMAL(9, 2) NOT NULL);
CREATE TABLE part (part_id INTEGER PRIMARY KEY, part_no VARCHAR NOT NULL, part_desc VARCHAR NOT NULL, unit_cost DECIMAL(8, 2) NOT NULL);
CREATE TABLE wo_part (wo_id INTEGER NOT NULL REFERENCES work_order(wo_id), part_id INTEGER NOT NULL REFERENCES part(part_id), qty INTEGER NOT NULL, PRIMARY KEY (wo_id, part_id));
CREATE TABLE fuel_card (card_id INTEGER PRIMARY KEY, drv_id INTEGER NOT NULL REFERENCES driver(drv_id), monthly_limit DECIMAL(8, 2) NOT NULL, active BOOLEAN NOT NULL);
INSERT INTO "depot" ("depot_id", "depot_nm", "city", "opened_dt") VALUES
  (1, 'North Yard', 'Rotterdam', DATE '2012-04-09'),
  (2, 'Harbour Gate', 'Antwerp', DATE '2016-09-12'),
  (3, 'Ring Road', 'Utrecht', DATE '2020-03-23'),
  (4, 'Airport Hub', 'Eindhoven', DATE '2023-04-10'),
  (5, 'Airport Hub 5', 'Eindhoven 5', DATE '2023-07-01');
INSERT INTO "vehicle" ("veh_id", "reg_no", "make", "model_yr", "fuel_type", "depot_id", "odometer_km", "retired") VALUES
  (1, 'VX-201-K', 'Renault', 2024, 'diesel', 1, 470150, FALSE),
  (2, 'VX-202-K', 'Mercedes', 2019, 'cng', 3, 63400, FALSE),
  (3, 'MB-114-P', 'Iveco', 2022, 'diesel', 4, 198450, FALSE),
  (4, 'MB-115-P', 'Volvo', 2018, 'electric', 4, 412300, FALSE),
  (5, 'RN-870-T', 'Ford', 2021, 'diesel', 1, 12050, TRUE),
  (6, 'RN-871-T', 'Iveco', 2022, 'diesel', 3, 41200, FALSE),
  (7, 'IV-033-B', 'Ford', 2020, 'diesel', 2, 470150, FALSE),
  (8, 'IV-034-B', 'Ford', 2019, 'diesel', 1, 12050, FALSE),
  (9, 'FD-640-L', 'Iveco', 2017, 'cng', 2, 88120, TRUE),
  (10, 'FD-641-L', 'Mercedes', 2024, 'diesel', 2, 412300, TRUE),
  (11, 'IV-034-B 11', 'Volvo', 2023, 'diesel', 2, 470150, TRUE),
  (12, 'VX-201-K 12', 'Ford', 2023, 'diesel', 1, 263700, FALSE);
INSERT INTO "driver" ("drv_id", "first_nm", "last_nm", "license_cls", "hire_dt", "depot_id", "mentor_drv_id") VALUES (1, 'Anouk', 'de Vries', 'C', DATE '2014-01-04', 2, NULL);
INSERT INTO "driver" ("drv_id", "first_nm", "last_nm", "license_cls", "hire_dt", "depot_id", "mentor_drv_id") VALUES (2, 'Bram', 'Jansen', 'B', DATE '2018-04-24', 1, 1);
INSERT INTO "driver" ("drv_id", "first_nm", "last_nm", "license_cls", "hire_dt", "depot_id", "mentor_drv_id") VALUES (3, 'Chloé', 'Peeters', 'CE', DATE '2017-01-09', 1, NULL);
INSERT INTO "driver" ("drv_id", "first_nm", "last_nm", "license_cls", "hire_dt", "depot_id", "mentor_drv_id") VALUES (4, 'Daan', 'Bakker', 'C', DATE '2021-05-21', 3, 1);
INSERT INTO "driver" ("drv_id", "first_nm", "last_nm", "license_cls", "hire_dt", "depot_id", "mentor_drv_id") VALUES (5, 'Eline', 'Maes', 'CE', DATE '2022-08-29', 2, 3);
INSERT INTO "driver" ("drv_id", "first_nm", "last_nm", "license_cls", "hire_dt", "depot_id", "mentor_drv_id") VALUES (6, 'Finn', 'Visser', 'CE', DATE '2023-03-06', 2, 4);
INSERT INTO "driver" ("drv_id", "first_nm", "last_nm", "license_cls", "hire_dt", "depot_id", "mentor_drv_id") VALUES (7, 'Giulia', 'Rossi', 'CE', DATE '2019-11-16', 4, NULL);
INSERT INTO "driver" ("drv_id", "first_nm", "last_nm", "license_cls", "hire_dt", "depot_id", "mentor_drv_id") VALUES (8, 'Hamza', 'El Idrissi', 'B', DATE '2023-12-15', 4, 7);
INSERT INTO "driver" ("drv_id", "first_nm", "last_nm", "license_cls", "hire_dt", "depot_id", "mentor_drv_id") VALUES (9, 'Hamza 9', 'El Idrissi 9', 'CE', DATE '2024-01-08', 3, 7);
INSERT INTO "driver" ("drv_id", "first_nm", "last_nm", "license_cls", "hire_dt", "depot_id", "mentor_drv_id") VALUES (10, 'Eline 10', 'Maes 10', 'CE', DATE '2022-08-29', 4, 3);
INSERT INTO "trip" ("trip_id", "veh_id", "drv_id", "start_dt", "distance_km", "fuel_l", "purpose") VALUES
  (1, 3, 5, DATE '2024-03-01', 402.7, 41.5, 'delivery'),
  (2, 3, 3, DATE '2024-03-01', 305.3, 140.3, 'delivery'),
  (3, 7, 3, DATE '2024-03-02', 210.0, 140.3, 'transfer'),
  (4, 2, 2, DATE '2024-03-02', 305.3, NULL, 'delivery'),
  (5, 4, 6, DATE '2024-04-23', 199.5, 70.1, 'delivery'),
  (6, 9, 1, DATE '2024-03-04', 288.9, NULL, 'pickup'),
  (7, 1, 6, DATE '2024-01-18', 288.9, NULL, 'delivery'),
  (8, 1, 5, DATE '2024-03-05', 451.2, 140.3, 'pickup'),
  (9, 4, 3, DATE '2024-03-06', 128.0, 81.0, 'delivery'),
  (10, 2, 8, DATE '2024-04-27', 72.3, 98.0, 'delivery'),
  (11, 6, 7, DATE '2024-03-08', 64.8, 140.3, 'delivery'),
  (12, 9, 2, DATE '2024-05-25', 451.2, NULL, 'delivery'),
  (13, 10, 1, DATE '2024-03-09', 402.7, NULL, 'delivery'),
  (14, 7, 2, DATE '2024-06-02', 72.3, 98.0, 'delivery'),
  (15, 10, 7, DATE '2024-03-12', 199.5, 90.7, 'transfer'),
  (16, 6, 8, DATE '2024-02-16', 55.0, NULL, 'delivery'),
  (17, 3, 4, DATE '2024-03-07', 210.0, 41.5, 'delivery'),
  (18, 6, 4, DATE '2024-03-04', 288.9, NULL, 'transfer'),
  (19, 3, 5, DATE '2024-03-02', 96.4, 90.7, 'transfer');
INSERT INTO "work_order" ("wo_id", "veh_id", "opened_dt", "closed_dt", "wo_type", "labor_hrs", "total_cost") VALUES
  (1, 2, DATE '2024-02-21', DATE '2024-02-22', 'recall', 6.5, 1280.00),
  (2, 3, DATE '2023-11-21', DATE '2023-12-05', 'repair', 6.5, 2240.60),
  (3, 8, DATE '2024-02-01', DATE '2024-02-02', 'recall', 6.5, 1875.90),
  (4, 4, DATE '2024-02-14', DATE '2024-02-15', 'service', 18.0, 420.00),
  (5, 1, DATE '2024-03-22', NULL, 'repair', 18.0, 80.00),
  (6, 3, DATE '2024-03-03', DATE '2024-03-03', 'repair', 9.0, 0.00),
  (7, 5, DATE '2024-03-15', NULL, 'repair', 2.0, 420.00),
  (8, 2, DATE '2024-01-18', DATE '2024-01-18', 'service', 6.5, 3150.75),
  (9, 1, DATE '2024-03-21', DATE '2024-03-22', 'service', 12.0, 1875.90),
  (10, 9, DATE '2024-04-25', NULL, 'service', 1.0, 80.00),
  (11, 7, DATE '2024-01-22', DATE '2024-02-05', 'inspection', 4.0, 0.00),
  (12, 5, DATE '2023-12-27', NULL, 'recall', 12.0, 0.00);
INSERT INTO "part" ("part_id", "part_no", "part_desc", "unit_cost") VALUES
  (1, 'BRK-PAD-22', 'front brake pads', 42.00),
  (2, 'OIL-5W30', 'engine oil 5W-30, 5 l', 410.00),
  (3, 'FLT-AIR-9', 'air filter', 410.00),
  (4, 'TYR-315-70', 'truck tyre 315/70', 27.80),
  (5, 'BAT-12V-HD', 'heavy duty battery', 410.00),
  (6, 'WPR-BLD-60', 'wiper blade', 27.80),
  (7, 'CLT-KIT-3', 'clutch kit', 690.00),
  (8, 'TYR-315-70 8', 'truck tyre 315/70 8', 690.00);
INSERT INTO "wo_part" ("wo_id", "part_id", "qty") VALUES
  (1, 2, 2),
  (1, 3, 2),
  (2, 1, 3),
  (2, 4, 3),
  (4, 2, 2),
  (4, 3, 2),
  (5, 5, 2),
  (7, 1, 1),
  (7, 4, 1),
  (7, 6, 1),
  (9, 3, 2),
  (10, 4, 1),
  (10, 1, 2);
INSERT INTO "fuel_card" ("card_id", "drv_id", "monthly_limit", "active") VALUES
  (1, 5, 1200.00, TRUE),
  (2, 1, 1500.00, TRUE),
  (3, 8, 1500.00, TRUE),
  (4, 2, 1000.00, TRUE),
  (5, 7, 900.00, TRUE),
  (6, 3, 1200.00, TRUE),
  (7, 1, 1200.00, TRUE);
